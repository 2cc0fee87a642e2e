"""What every benchmark shares: the methods compared and how runs are kept apart.

- `scaling`: the methods (float32, Keras's `LossScaleOptimizer`, fixed global
  scales, keras_als with a policy), precision switching, unscaled gradients.
- `xla_step`: the compiled training step the methods share.
- `isolation`: seeds, fresh sessions, worker and fresh processes, build order.
- `stats`: means, standard errors, differences paired by seed.
- `provenance`: the machine and the keras_als code a result was measured on.
- `xla_memory`: a compiled step's memory (XLA's buffer assignment) and the
  process's peak resident set.
- `zoo`: the small models and data of the suite, also trained by `heavy_tails`
  and `hard_outcomes`.
- `hub_tasks`: tiny KerasHub tasks (RetinaNet, GPT-2, Gemma, DeepLabV3, ViT,
  T5) and their offline data, for `keras_hub_tasks`, `real_models` and the tests.

Importing any of them quiets TensorFlow's C++ and Python logs.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import tensorflow as tf  # noqa: E402

tf.get_logger().setLevel("ERROR")  # retracing notices from the per-method steps
