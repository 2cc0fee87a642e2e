"""What keras_als costs at real size: step time, first step and XLA's step memory.

The question: on the architectures users train, at their published sizes,
how much longer does a training step take with keras_als than with Keras's
`LossScaleOptimizer` (Keras LSO), how much longer the first step (trace, XLA
compile, run), and how much more memory does XLA's compiled step hold at its
peak? And how does the cost grow with the number of scale boundaries?

The plan (`plan.py`), fixed before the first number:

- models: keras.applications DenseNet121/169/201, ResNet50/101/152,
  EfficientNetB0-B3, ConvNeXtTiny, MobileNetV3Small/Large (`weights=None`,
  64x64 images, 10 classes, their own top); KerasHub BERT-Base, ViT-Base,
  GPT-2 base (published sizes), a Swin-T-shaped classifier and a
  Llama-shaped decoder at reduced width; all built from their constructors,
  nothing downloaded. A depth sweep: DenseNets of 4 dense blocks with
  `DEPTHS` layers each, the same settings.
- settings, one for both methods: `mixed_float16`, `jit_compile=True`, SGD
  (learning rate 0.01), batch 4, 64 tokens for the text models; Keras LSO
  with its defaults; keras_als's `wrap_model` and
  `AdaptiveLossScaleOptimizer` with its defaults.
- per model, in one fresh process, after a tiny model of each method is
  compiled untimed (the first program of a process pays for starting XLA):
  `INSTANCES` compiled instances of each
  method, built in the order Keras, keras_als, keras_als, Keras (ABBA); the
  first step of each timed (trace, compile, run); XLA's buffer assignment of
  each instance's compiled step read for its peak; every instance warmed up by
  `WARMUP` steps (past keras_als's measuring-period ramp, 1, 2, 4, 8, then
  every 16 steps); then `ROUNDS` rounds, each one step of every instance in a
  shuffled order. A ratio is keras_als's geometric mean over Keras's, with the
  standard error of the log ratio from the instances' spread
  (`benchmarks.harness.stats.ratio_and_standard_error`): per instance, the
  median step, the first step, the peak.
- targets (issue 79): step <= 1.02x, first step <= 1.10x, peak step memory
  <= 1.02x of Keras LSO's. A miss is printed, with its cause where known.

    python -m benchmarks.cost_at_size --models densenet121 vit_base
    python -m benchmarks.cost_at_size --sweep

Each model runs in a process of its own (XLA keeps every executable it
compiled until its process ends); results merge into
`benchmarks/results/cost_at_size.json` and `.md`, keeping the models not run.
"""
