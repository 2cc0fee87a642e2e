"""The traced training step: what the forward pass, `scale_loss`, backprop and
`apply` do in one traced function.

- `_step_record`: the one hand-off between the phases of a step;
- `_layer_call`, `_boundary`, `_forward_state`: the forward side (boundaries
  around a scaled layer's call, the state it updates);
- `_early_build`: the optimizer built in the first trace without a second one;
- `_plan`, `_crossings`, `_indices`: the plan of the backward pass (scale
  components, their scales, read at indices XLA cannot see) and the
  reductions of the gradients crossing the boundaries;
- `_apply_phases`, `_reductions`, `_statistics`, `_skip`, `_scale_state`,
  `_entries`: what `apply` does: unscale, check, measure, choose, apply or
  skip, and the optimizer's state per scale.
"""
