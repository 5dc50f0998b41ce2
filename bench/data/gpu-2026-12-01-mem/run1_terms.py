import json,os,sys,time,functools,torch,numpy as np,torch.nn.functional as F
from trainscout.trial.models import build_model,resolve_model,sizes
from trainscout.spaces.layers import decoder_layers
def E(**r):print(json.dumps(r),flush=True)
B16=torch.bfloat16;C='cuda'
M={n:resolve_model(p).config for n,p in(('tiny','tiny'),('160m','pythia-160m'),('1b','pythia-1b'),('llama','bench/models/llama-1b.json'))}
def policy():
 x=torch.randn(4,64,64,device=C,dtype=B16);w=torch.randn(64,64,device=C)
 cs=dict(linear=lambda:F.linear(x,w),matmul=lambda:x@x,layer_norm=lambda:F.layer_norm(x,(64,)),rms_norm=lambda:F.rms_norm(x,(64,)),softmax=lambda:x.softmax(-1),pow=lambda:x**2,rsqrt=lambda:x.rsqrt(),exp=lambda:x.exp(),sum=lambda:x.sum(-1),silu=lambda:F.silu(x),einsum=lambda:torch.einsum('bij,bjk->bik',x,x),sdpa=lambda:F.scaled_dot_product_attention(x[None],x[None],x[None]))
 with torch.autocast(C,dtype=B16):E(p='policy',**{k:str(f().dtype)[6:] for k,f in cs.items()})
class Ops(torch.utils._python_dispatch.TorchDispatchMode):
 def __torch_dispatch__(s,f,t,a=(),k=None):
  s.ops.append(str(f.overloadpacket));return f(*a,**(k or{}))
def sdpa():
 b,s,d=2,512,64
 for n,(hq,hk,dt,mk,g) in {'bf16':(16,16,B16,0,0),'bf16gqa':(16,4,B16,0,1),'bf16mask':(16,16,B16,1,0),'fp32':(16,16,torch.float32,0,0),'fp32gqa':(16,4,torch.float32,0,1)}.items():
  q=torch.randn(b,s,hq,d,device=C,dtype=dt).transpose(1,2).requires_grad_()
  k,v=(torch.randn(b,s,hk,d,device=C,dtype=dt).transpose(1,2).requires_grad_() for _ in'kv')
  m=torch.ones(s,s,device=C,dtype=torch.bool).tril()[None,None].expand(b,1,s,s) if mk else None
  sv=[];o=Ops();o.ops=[]
  try:
   with torch.autograd.graph.saved_tensors_hooks(lambda t:sv.append((list(t.shape),str(t.dtype)[6:],t.untyped_storage().nbytes())) or t,lambda t:t),o:
    out=F.scaled_dot_product_attention(q,k,v,attn_mask=m,is_causal=not mk,enable_gqa=bool(g))
   E(p='sdpa',c=n,ops=[x for x in o.ops if 'att' in x or 'soft' in x or 'bmm' in x],stride=list(out.stride()),saved=sv)
  except Exception as e:E(p='sdpa',c=n,err=str(e)[:200])
def count(model,comp,bt=2,seqs=(256,512,768)):
 if comp=='16-bit':model.to(B16)
 model.train();L=decoder_layers(model);sk={t.untyped_storage()._cdata for t in(*model.parameters(),*model.buffers())};st=[None];rows=[]
 for i,l in enumerate(L):
  l.register_forward_pre_hook(lambda m,a,i=i:st.__setitem__(0,i));l.register_forward_hook(lambda *_:st.__setitem__(0,None))
 for s in seqs:
  per={}
  def pk(t):
   i=t.untyped_storage()._cdata
   if i not in sk and not any(i in d for d in per.values()):per.setdefault(st[0],{})[i]=t.untyped_storage().nbytes()
   return t
  with torch.autograd.graph.saved_tensors_hooks(pk,lambda t:t),torch.autocast(C,dtype=B16,enabled=comp=='autocast'):
   out=model(input_ids=torch.zeros(bt,s,dtype=torch.long,device=C))
  del out;rows.append((s,sum(sum(d.values()) for k,d in per.items() if k is not None)/len(L),sum(per.get(None,{}).values())))
 X=np.array([[1,bt*s,bt*s*s] for s,*_ in rows])
 a=np.linalg.lstsq(X,np.array([r[1] for r in rows]),rcond=None)[0];o=np.linalg.lstsq(X,np.array([r[2] for r in rows]),rcond=None)[0]
 return a[1],a[2],o[1]
def saved():
 for n,cfg in M.items():
  h=sizes(cfg).hidden
  for at in('sdpa','eager'):
   for comp in('autocast','16-bit','fp32'):
    with torch.device(C):m=build_model(cfg,at,1024)
    a,b,o=count(m,comp);del m;torch.cuda.empty_cache()
    E(p='saved',m=n,a=at,c=comp,per_layer_h=round(a/h,3),s_term=round(b,3),outside_h=round(o/h,3))
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
    del lg;af=torch.cuda.memory_allocated()-b0;fp=torch.cuda.max_memory_allocated()-b0;torch.cuda.reset_peak_memory_stats()
    l.backward();bp=torch.cuda.max_memory_allocated()-b0;u=b*s*V
    E(p='loss',V=V,k=kn,rep=rep,after_fwd=round(af/u,3),fwd_peak=round(fp/u,3),bwd_peak=round(bp/u,3),head_parts=round((6*V*h+2*b*s*h)/u,3))
    del hd,x,y,l;torch.cuda.empty_cache()
def step():
 from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointImpl as CI,checkpoint_wrapper as cw
 for n,mb,ck,lk in(('160m',8,0,'eager'),('160m',16,1,'eager'),('160m',16,0,'compiled'),('1b',4,0,'eager'),('1b',8,1,'eager'),('llama',4,0,'eager'),('llama',8,1,'eager')):
  cfg=M[n]
  with torch.device(C):m=build_model(cfg,'sdpa',2048)
  if ck:
   L=decoder_layers(m)
   for i in range(len(L)):L[i]=cw(L[i],checkpoint_impl=CI.NO_REENTRANT)
  if lk=='compiled':m.loss_function=torch.compile(m.loss_function)
  opt=torch.optim.AdamW(m.parameters(),lr=1e-4,fused=True);V=sizes(cfg).vocab;ph={}
  def up(k,v):ph[k]=max(ph.get(k,0),v/2**30)
  for st in range(3):
   for mi in range(2):
    ids=torch.randint(0,V,(mb,2048),device=C);torch.cuda.reset_peak_memory_stats()
    with torch.autocast(C,dtype=B16):l=m(input_ids=ids,labels=ids).loss
    up('fwd',torch.cuda.max_memory_allocated());up('after_fwd',torch.cuda.memory_allocated());torch.cuda.reset_peak_memory_stats()
    l.backward();up('bwd',torch.cuda.max_memory_allocated());del l
   torch.cuda.reset_peak_memory_stats();opt.step();opt.zero_grad(set_to_none=True);up('step',torch.cuda.max_memory_allocated())
  E(p='step',m=n,mbs=mb,ckpt=ck,loss=lk,**{k:round(v,3) for k,v in ph.items()})
  del m,opt;torch.cuda.empty_cache()
import transformers;E(p='v',torch=torch.__version__,tf=transformers.__version__)
for a in sys.argv[1].split(','):
 t=time.time()
 try:globals()[a]()
 except Exception as e:E(p='fail '+a,e=repr(e)[:300])
 E(p=a,s=round(time.time()-t,1))
