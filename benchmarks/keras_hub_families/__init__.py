"""Every KerasHub family that trains in float32, trained tiny under each method (issue 80).

    python -m benchmarks.keras_hub_families                      # the sweep
    python -m benchmarks.keras_hub_families --families bert,gpt2 --seeds 1

The plan (written before the first number; a change after a run is said here):

- Families (`families.FAMILIES`, built by `builders`, data from `batches`): each
  KerasHub 0.32 family that can be built
  tiny from its constructors with nothing downloaded, as its task class with
  `preprocessor=None` where KerasHub has one for the data, else its backbone
  and a float32 head (a Dense of logits). Text classifiers (BERT, DistilBERT,
  RoBERTa, XLM-R, ALBERT, DeBERTaV3, ELECTRA, FNet, RoFormerV2, XLNet, ESM),
  causal LMs (GPT-2, Gemma, Gemma3, Llama, Llama3, Mistral, Mixtral, OPT,
  Qwen, Qwen2, Qwen3, Qwen-MoE, Qwen3-MoE, Phi3, Bloom, GPT-NeoX, Falcon,
  SmolLM3, RWKV7, GPT-OSS), seq2seq LMs (T5, BART, T5Gemma), image
  classifiers (ViT, DeiT, Swin, ResNet, EfficientNet, DenseNet, MiT, CSPNet,
  VGG, MobileNet, HGNetV2, Xception, DINOv2), segmenters (DeepLabV3,
  SegFormer, BASNet) and audio (Whisper, Moonshine). Tiny: 1-2 blocks,
  hidden 32 (64 where a constructor needs it), vocabulary 1,000, 16 tokens,
  32x32 images. Dropout 0 where the constructor takes it.
- Data, real and offline: text is the docstrings of Python's standard library
  (`benchmarks.harness.hub_tasks`'s two module lists), split into words, each
  word hashed (CRC-32) into the vocabulary; classifiers tell which module list
  a 16-word window comes from, LMs predict the next word, seq2seq LMs read a
  window and predict it shifted by one word. Images are scikit-learn's digits
  (8x8, upsampled to 32x32, grey in 3 channels), 10 classes; segmenters label
  each pixel with the digit's class + 1 where the digit's ink is, else 0.
  Audio: Whisper reads a digit's 32x32 image as 32 frames of 32 mel bins and
  transcribes it as the word of its class; Moonshine reads a digit's pixels as
  a waveform (1,024 samples) and does the same. 160 training examples, 32
  held out, the same for every seed.
- Methods (`study.METHODS`): float32, mixed_float16 without loss scaling,
  Keras's `LossScaleOptimizer`, keras_als (`wrap_model`, default policy) and
  keras_als + `Float32Fallback` given the seed's first 16 training examples
  (its first 4 batches; `flat_regions.plan.FALLBACK`). Adam 1e-3, batch 4, 40 steps in 4 blocks of
  10, all methods from the same float32 weights on the same batches,
  interleaved block by block (`keras_hub_tasks.training`), seeds 1 and 2 (the
  weights and the batch order). `model.fit` in a TensorFlow graph
  (`jit_compile=False`): for 40 steps tracing costs less than compiling with
  XLA, and an XLA compile failure in float16 is not the question here.
- Recorded per family, method and seed: the final training loss (the last
  block's mean), the held-out loss (the task's own loss on the 32 held-out
  examples), skipped steps, the layers the fallback set to float32
  (`Float32Fallback.applied`) and any error. A family whose float32 build or
  training fails is listed with its error and no verdict (a KerasHub bug that
  float32 also hits is not keras_als's). Added after the first families had
  run (RoFormerV2 and ESM, whose rotary embeddings call `range` in float16,
  which TensorFlow has no kernel for), before any table: a family where every
  mixed_float16 method raises, Keras's `LossScaleOptimizer` and the one
  without scaling too, gets no verdict either (`float16 fails`): a KerasHub
  bug in float16, not keras_als's.
- Seed noise and the verdict, fixed before the numbers: with float32's
  held-out losses on the two seeds `a` and `b`, the noise is
  `max(2 * |a - b|, 0.02 * (a + b) / 2)`. A family *passes* when
  keras_als + `Float32Fallback`'s held-out loss, averaged over the seeds, is
  finite and within the noise of float32's average (or below it), and on each
  seed it skipped no more steps than Keras's `LossScaleOptimizer`. A family run
  on one seed uses the 2% tolerance alone.
- Cost rule (set after timing one 4-step run of BERT, GPT-2 and ViT, about
  45 s a family and seed, before any 40-step number): the families run in
  subprocesses (`keras.utils.clear_session()` between two families of one
  subprocess; a crash restarts the subprocess at the next family), seed 1 for
  every family first, then seed 2 in the same order. One family's seed that
  runs more than 600 s is stopped and listed as timed out. When the sweep
  has run 45 minutes (on one core), no new family's seed starts: those not
  started are listed as not run, and their families are judged on seed 1
  alone (the 2% tolerance).
- What happened (said after the run): the sweep of 2026-12-05 ran 47.5
  minutes and reached no seed 2. BASNet (its KerasHub refinement head holds
  51 million weights at any size) ran its 600 s and was stopped, past the
  budget, so Whisper and Moonshine, after it, did not start. They were then
  run on seed 1 by `--families whisper,moonshine --seeds 1` (about 2 minutes,
  the total within the brief's hour), which keeps the sweep's other runs;
  no family got seed 2 in that run. Seed 2 of the other 49 families was
  then run by `--families <all but basnet> --seeds 2` (37 minutes on one
  core), which keeps the seed 1 runs: every verdict but BASNet's uses both
  seeds and their noise.
- Re-runs after two changes to keras_als (the plan unchanged): `diagnose`
  now also traces the forward pass in a graph, where the rotary embeddings'
  float16 `range` raises, so RoFormerV2 and ESM were run again on both
  seeds (`--families roformer_v2,esm2`) and get verdicts; `Float32Fallback`
  now moves a layer where overflows started on 3 steps within 50, so
  RWKV7 was run again (`--families rwkv7`). The rule needs 3 skipped steps
  in one run: no other family's fallback run skipped more than 2, so their
  runs stand. BASNet's seed 1 was run to its end with `--family-seconds`
  above the plan's 600 s (its time is in its rows), on a core of its own.

Modules: `families` (the builders and their data), `study` (one family's run),
`report` (the verdicts, the table and why a family did not pass), `command`
(the command line), `skips` (where keras_als skipped a step that Keras's
optimizer did not, on one family and seed).
"""
