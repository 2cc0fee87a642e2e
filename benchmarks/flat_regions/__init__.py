"""Vision transformers on images with flat regions, where float16's range decides.

    python -m benchmarks.flat_regions            # 3 models x 7 methods x 5 seeds (Swin 10)
    python -m benchmarks.flat_regions --quick    # checks that it runs; numbers mean nothing

A LayerNorm over a token whose values are all equal (a patch of black
background) divides by sqrt(epsilon); chained through a few of them, the
gradients of the first layers reach 1e10 and more in float32, beyond any
float16 scale. The study trains KerasHub's Swin classifier, SegFormer
segmenter and ViT classifier (the control: its position embeddings make no
token flat) on digits pasted into canvases of exact zeros, under each method,
and names the layers no float16 scale can hold (`keras_als.diagnose`).

    python -m benchmarks.flat_regions.mechanism  # the mechanism, per layer

measures why on seed 1: float32's gradient range per layer at the start and
later, and the share of gradient values each mixed method loses.

Modules: `models` (the tasks and their data), `plan` (the plan, fixed before
the first number, and one seed's run), `report` (the tables), `command` (the
command line), `mechanism` and `mechanism_report` (the per-layer measurement).
"""
