import gc,json,torch
from trainscout.trial.models import build_model,resolve_model,sizes
from trainscout.spaces.layers import decoder_layers
def E(**r):print(json.dumps(r),flush=True)
C='cuda';B16=torch.bfloat16
def held(m,ids,uc):
 for _ in range(2):
  with torch.autocast(C,dtype=B16):o=m(input_ids=ids,use_cache=uc).logits
  o.float().sum().backward();del o
 m.zero_grad(set_to_none=True);gc.collect();torch.cuda.synchronize();a=torch.cuda.memory_allocated()
 with torch.autocast(C,dtype=B16):o=m(input_ids=ids,use_cache=uc).logits
 torch.cuda.synchronize();d=torch.cuda.memory_allocated()-a;del o;return d
for n in('pythia-160m','bench/models/llama-1b.json'):
 cfg=resolve_model(n).config;h=sizes(cfg).hidden;L=cfg['num_hidden_layers'];b,s=2,1024;u=L*b*s*h
 with torch.device(C):m=build_model(cfg,'sdpa',2048)
 ids=torch.zeros(b,s,dtype=torch.long,device=C);r={}
 r['eager']=held(m,ids,False)
 ls=decoder_layers(m)
 for i in range(L):ls[i]=torch.compile(ls[i])
 r['compiled_nocache']=held(m,ids,False);torch._dynamo.reset()
 for i in range(L):ls[i]=torch.compile(ls[i]._orig_mod)
 r['compiled_cache']=held(m,ids,None)
 E(m=n,**{k:round(v/u,3) for k,v in r.items()},unit='bytes per token per layer / h')
 del m,ls;gc.collect();torch.cuda.empty_cache();torch._dynamo.reset()
