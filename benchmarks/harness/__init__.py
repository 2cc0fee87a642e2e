"""What every benchmark shares: the methods compared and how runs are kept apart.

- `scaling`: the methods (float32, Keras's `LossScaleOptimizer`, fixed global
  scales, keras_als with a policy), precision switching, unscaled gradients.
- `xla_step`: the compiled training step the methods share.
- `isolation`: seeds, fresh sessions, worker and fresh processes, build order.
- `stats`: means, standard errors, differences paired by seed.
- `provenance`: the machine and the keras_als code a result was measured on.

Importing any of them quiets TensorFlow's C++ and Python logs.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import tensorflow as tf  # noqa: E402

tf.get_logger().setLevel("ERROR")  # retracing notices from the per-method steps
