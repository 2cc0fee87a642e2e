"""KerasHub tasks trained as users train them: each method beside the others.

    python -m benchmarks.keras_hub_tasks retinanet  # RetinaNet, 4 methods x 5 seeds
    python -m benchmarks.keras_hub_tasks lora       # LoRA fine-tuning of Gemma
    python -m benchmarks.keras_hub_tasks lora --quick

Two studies of issue 40, on tiny tasks built from their constructors
(`benchmarks.harness.hub_tasks`, nothing downloaded), trained by `model.fit` with XLA
and the task's own loss: KerasHub's RetinaNet detector on the pasted digits,
scored by the detection benchmark's mAP (`retinanet`), and LoRA fine-tuning of
a pretrained tiny Gemma causal LM on the standard library's docstrings, scored
by its held-out loss (`lora`). Each module's docstring holds its plan, fixed
before the first number. Both compare float32, mixed_float16 without loss
scaling, Keras's `LossScaleOptimizer` and keras_als on the same initial
weights and batches, and time every method in one process, block by block,
interleaved (`training`), so the step-time and compile-time ratios are paired.

Modules: `training` (the methods side by side), `retinanet`, `lora` (the
plans), `report` (tables and paired comparisons), `command` (the command line).
"""
