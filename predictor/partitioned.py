"""What torch.compile's partitioned forward of a decoder layer saves for its backward, traced on the meta device
(predictor/model_tree.saved(..., compiled=scope))."""
from __future__ import annotations

from .cuda_like import cuda_like_mode, storage_id
from .saved_bytes import BATCH, SEQS


def partitioned(model, attention: str, compute: str) -> tuple[float, float]:
    """Bytes per token (and per token·position) the first decoder layer's forward graph saves for its backward
    under torch.compile: the layer as the model calls it (its
    arguments caught on the meta device), traced by AOTAutograd with inductor's decompositions and min-cut
    partitioner; what the forward graph hands to the backward, less the parameters and what is computed from them
    alone (autocast's copies). How it compares with a GPU's compiled layers: docs/predictor.md."""
    import numpy as np
    import torch
    import torch.utils._pytree as pytree
    from torch._functorch.aot_autograd import aot_function
    from torch._functorch.partitioners import min_cut_rematerialization_partition
    from torch._inductor.decomposition import select_decomp_table
    from torch.func import functional_call

    from trainscout.spaces.layers import decoder_layers
    low = torch.bfloat16
    if compute == "16-bit":
        model.to(low)
    model.train()
    layer = decoder_layers(model)[0]
    names, params = zip(*layer.named_parameters())
    rows = []
    for s in SEQS if attention == "eager" else SEQS[-1:]:  # fused attention: nothing grows with s², one length
        caught = {}

        def catch(module, args, kwargs):
            caught.update(args=args, kwargs=kwargs)
            raise _Caught

        hook = layer.register_forward_pre_hook(catch, with_kwargs=True)
        try:
            with cuda_like_mode(low if compute == "autocast" else None, fused=attention == "sdpa"):
                model(input_ids=torch.zeros(BATCH, s, dtype=torch.long, device="meta"))
        except _Caught:
            pass
        finally:
            hook.remove()
        leaves, tree = pytree.tree_flatten((caught["args"], caught["kwargs"]))
        where = [i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor)]

        def layer_fn(*flat):
            filled = list(leaves)
            for i, t in zip(where, flat[len(params):]):
                filled[i] = t
            args, kw = pytree.tree_unflatten(filled, tree)
            out = functional_call(layer, dict(zip(names, flat[:len(params)])), args, kw)
            return out[0] if isinstance(out, tuple) else out

        graphs = []
        traced = aot_function(layer_fn, fw_compiler=lambda gm, _: graphs.append(gm) or gm, bw_compiler=lambda gm, _: gm,
                              partition_fn=min_cut_rematerialization_partition, decompositions=select_decomp_table())
        with cuda_like_mode(low if compute == "autocast" else None, fused=attention == "sdpa"):
            traced(*params, *(leaves[i] for i in where))
        rows.append((s, _graph_saved(graphs[0], len(params))))
    if len(rows) == 1:
        return rows[0][1] / (BATCH * rows[0][0]), 0.0
    X = np.array([[BATCH * s, BATCH * s * s] for s, _ in rows])
    alpha, beta = np.linalg.lstsq(X, np.array([r[1] for r in rows]), rcond=None)[0]
    return float(alpha), float(beta if beta * max(SEQS) > 1e-6 * abs(alpha) else 0.0)


class _Caught(Exception):
    """Raised by a forward pre-hook once it has the layer's arguments."""


def _graph_saved(gm, n_params: int) -> int:
    """Bytes of the distinct storages a partitioned forward graph outputs for its backward (its outputs after the
    layer's own), less the parameters and the tensors computed from parameters alone."""
    import torch
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    from_params = set(placeholders[:n_params])
    for n in gm.graph.nodes:
        if n.op == "call_function" and n.all_input_nodes and all(i in from_params for i in n.all_input_nodes):
            from_params.add(n)
    outputs = next(n for n in gm.graph.nodes if n.op == "output").args[0]
    storages = {}
    for n in outputs[1:]:
        v = getattr(n, "meta", {}).get("val")
        if isinstance(v, torch.Tensor) and n not in from_params:
            storages.setdefault(storage_id(v), v.untyped_storage().nbytes())
    return sum(storages.values())
