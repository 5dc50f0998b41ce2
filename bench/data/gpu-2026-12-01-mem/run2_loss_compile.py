import gc,json,sys,time,torch,numpy as np
from trainscout.trial.models import build_model,resolve_model,sizes
from trainscout.spaces.layers import decoder_layers
def E(**r):print(json.dumps(r),flush=True)
B16=torch.bfloat16;C='cuda'
def count(model,bt=2,seqs=(256,512,768)):
 model.train();sk={t.untyped_storage()._cdata for t in(*model.parameters(),*model.buffers())};rows=[]
 for s in seqs:
  per={}
  def pk(t):
   i=t.untyped_storage()._cdata
   if i not in sk:per.setdefault(i,t.untyped_storage().nbytes())
   return t
  with torch.autograd.graph.saved_tensors_hooks(pk,lambda t:t),torch.autocast(C,dtype=B16):
   out=model(input_ids=torch.zeros(bt,s,dtype=torch.long,device=C))
  del out;rows.append(sum(per.values()))
 X=np.array([[1,bt*s] for s in seqs]);return np.linalg.lstsq(X,np.array(rows),rcond=None)[0][1]
def comp():
 for n in('pythia-160m','bench/models/llama-1b.json'):
  cfg=resolve_model(n).config;h=sizes(cfg).hidden;L=cfg['num_hidden_layers']
  with torch.device(C):m=build_model(cfg,'sdpa',1024)
  e=count(m);ls=decoder_layers(m)
  for i in range(len(ls)):ls[i]=torch.compile(ls[i])
  t=time.time();c=count(m)
  E(p='comp',m=n,eager_tok_h=round(e/h,3),compiled_tok_h=round(c/h,3),per_layer_diff_h=round((e-c)/h/L,3),s=round(time.time()-t,1))
  del m,ls;gc.collect();torch.cuda.empty_cache()
def loss():
 from transformers.loss.loss_utils import ForCausalLMLoss as LF
 for V in(50304,128256):
  for kn in('eager','compiled'):
   fn=LF if kn=='eager' else torch.compile(LF)
   for rep in range(2):
    b,s,h=4,2048,1024;hd=torch.nn.Linear(h,V,bias=False,device=C);x=torch.randn(b,s,h,device=C,requires_grad=True);y=torch.randint(0,V,(b,s),device=C)
    torch.cuda.synchronize();b0=torch.cuda.memory_allocated();torch.cuda.reset_peak_memory_stats()
    with torch.autocast(C,dtype=B16):
     lg=hd(x);l=fn(lg,y,V)
    del lg;af=torch.cuda.memory_allocated()-b0;torch.cuda.reset_peak_memory_stats()
    l.backward();bp=torch.cuda.max_memory_allocated()-b0;u=b*s*V
    E(p='loss',V=V,k=kn,rep=rep,after_fwd=round(af/u,3),bwd_peak=round(bp/u,3),head=round((6*V*h+2*b*s*h)/u,3))
    del hd,x,y,l;gc.collect();torch.cuda.empty_cache()
for a in sys.argv[1].split(','):
 t=time.time()
 try:globals()[a]()
 except Exception as e:E(p='fail '+a,e=repr(e)[:300])
 E(p=a,s=round(time.time()-t,1))
