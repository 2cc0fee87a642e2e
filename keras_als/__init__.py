"""keras_als: adaptive (layer-wise) loss scaling for float16 training in Keras 3.

Seven parts:

- `wrap_model` instruments the user's own model in place: a scale boundary
  at the inputs of every layer with trainable weights, at any depth, and of
  every join (`unwrap_model` removes them); `AdaptiveScaled` wraps one layer
  by hand.
- `AdaptiveLossScaleOptimizer` (a `keras.optimizers.LossScaleOptimizer`) gives
  each region of the backward graph between boundaries its own power-of-two
  scale and unscales every weight gradient by the scale it was computed at.
- `policies` choose the next scales from the last step's gradient statistics.
- `ScaleMonitor` (a Keras callback) and `plot_scales` show the per-layer
  scales, estimated underflow and overflows in logs, TensorBoard and a figure.
- `diagnose` names the layers no float16 scale can hold (their gradients
  span more than float16's range, or their float16 output is not finite),
  measured on one batch; its `Diagnosis.apply` computes them in float32.
- `calibrate` chooses every scale from a float32 measurement of one batch
  before the first step, so that none is skipped finding them.
- `Float32Fallback` (a Keras callback) diagnoses and calibrates when `fit`
  begins, and diagnoses again when the optimizer's telemetry says float16
  no longer holds a layer.

Example:

>>> import keras, keras_als
>>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
>>> keras_als.wrap_model(model) is model
True
>>> model.compile(keras_als.AdaptiveLossScaleOptimizer(keras.optimizers.Adam()), "mse")
"""

import keras as _keras

if _keras.config.backend() != "tensorflow":
    raise ImportError(
        "keras_als needs Keras's TensorFlow backend, but Keras runs on "
        f"{_keras.config.backend()!r}. Set the environment variable KERAS_BACKEND=tensorflow "
        'before importing keras (or set "backend" in ~/.keras/keras.json).'
    )

from keras_als import _version, policies  # noqa: E402
from keras_als.float32.calibration import calibrate  # noqa: E402
from keras_als.float32.diagnosis import Diagnosis, diagnose  # noqa: E402
from keras_als.float32.fallback import Float32Fallback  # noqa: E402
from keras_als.instrument import unwrap_model, wrap_model  # noqa: E402
from keras_als.optimizer import AdaptiveLossScaleOptimizer  # noqa: E402
from keras_als.telemetry.monitor import ScaleMonitor  # noqa: E402
from keras_als.telemetry.plots import plot_scales  # noqa: E402
from keras_als.wrapper import AdaptiveScaled  # noqa: E402

__all__ = [
    "AdaptiveLossScaleOptimizer",
    "AdaptiveScaled",
    "Diagnosis",
    "Float32Fallback",
    "ScaleMonitor",
    "calibrate",
    "diagnose",
    "plot_scales",
    "policies",
    "unwrap_model",
    "wrap_model",
]
__version__ = _version.version()
