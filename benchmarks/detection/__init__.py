"""A detection-shaped benchmark: an SSD-like model on digits pasted into canvases.

    python -m benchmarks.detection          # full plan (5 seeds), ~25 min on 2 cores
    python -m benchmarks.detection --quick  # 1 seed, fewer steps, fewer methods
    python -m benchmarks.detection --sweep  # the float32 sweep behind LEARNING_RATES

The seed paper's detection result (SSD512 on VOC: float32 78.94 mAP, adaptive
79.27, fixed 8/128/256 78.83/78.71/78.36, dynamic 75.04, no scaling diverged)
is the one where its method mattered most. This is a CPU-sized version of that
setting, with everything that makes SSD what it is for loss scaling:

- data: scikit-learn's 8x8 digits (shipped in the wheel; nothing is
  downloaded), 1-3 per 48x48 canvas, each resized to 8..20 pixels a side;
  box = the digit's ink, class = the digit. Train, validation and held-out
  canvases come from disjoint digit images and fixed seeds (`DATA_SEEDS`).
- model: a VGG-like convolution stack without BatchNormalization, an L2
  normalisation with a learned per-channel scale initialised at 20 on the
  early (12x12) feature map (SSD's conv4_3 L2Norm), 4 default boxes per
  location on a 12x12 and a 6x6 map (720 in all), a class and a box Conv2D
  head per map, outputs cast to float32.
- loss: SSD's multibox loss. Anchors are matched to ground truth in NumPy when
  the data is made (IoU >= 0.5, plus the best anchor of every box), offsets
  encoded with variances 0.1/0.2; softmax cross-entropy with hard negative
  mining (3 negatives per positive, per image), smooth L1 on the positives'
  offsets, summed over the batch and divided by the number of matched anchors.
- metric: mAP at IoU 0.5 on the held-out canvases (decode, per-class NMS at
  0.45, VOC all-point interpolated AP), in NumPy.

Every method trains from the same float32 initial weights per seed (built once
in this process and copied into each run) on the same batches, with one
learning rate and step count per inner optimizer, chosen on float32 alone
(`LEARNING_RATES`, `STEPS`). Methods: float32; mixed_float16 with no loss
scaling; Keras's `LossScaleOptimizer`; global fixed scales 8, 128 and 256 (the
paper's); keras_als max_safe and approx_range. Runs are custom XLA steps
(`xla_step.compiled_step`), not `model.fit`: `model.compile` would wrap the
no-scaling row's optimizer in a `LossScaleOptimizer` under mixed_float16.

Modules: `canvases` (the data), `geometry` (IoU, default boxes, encoding, matching),
`ssd` (model and loss), `metric` (mAP), `plan` (methods, training, sweep),
`report` (detection.md), `command` (the command line).
"""
