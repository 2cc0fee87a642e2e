"""The float32 side: layers float16 cannot hold.

`diagnosis` (`keras_als.diagnose`) finds them on one batch, watching the
forward pass layer by layer (`_forward_checks`); `calibration`
(`keras_als.calibrate`) chooses every scale from one float32 measurement;
`fallback` (`keras_als.Float32Fallback`) does both during `fit`.
"""
