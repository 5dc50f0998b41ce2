"""What a configuration will need and take, predicted before anything is launched: peak memory per rank (memory.py),
the step's time (steptime.py) and FLOPs per token (flops.py), read from the model's module tree on the meta device
(model_tree.py, with cuda_like.py, saved_bytes.py and partitioned.py), and the dtypes a trial trains in (dtypes.py).
What crosses its doors is typed (spaces/roles.py): the memory terms the knobs' Costs.memory adjust (MemoryTerms), the
optimizer's spec (OptimizerSpec) and a knob's declared costs (Costs). Importing it imports no torch."""
