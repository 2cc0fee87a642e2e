"""What the optimizer says about the scaling.

`_telemetry` reads the optimizer's state as plain values, `_mistakes`
catches a user's mistakes and gives the warnings, `monitor`
(`keras_als.ScaleMonitor`) logs per-layer numbers during `fit`, `plots`
(`keras_als.plot_scales`) draws them.
"""
