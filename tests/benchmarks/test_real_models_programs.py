"""The real models' study reading compiled programs: kernels, fusions and
the operations behind them."""


def test_the_kernels_of_a_compiled_step_are_its_entry_instructions_that_run_work():
    from benchmarks.real_models import programs

    hlo = """HloModule step

%fused_computation (p: f32[4]) -> f32[4] {
  %p = f32[4]{0} parameter(0)
  ROOT %m = f32[4]{0} multiply(f32[4]{0} %p, f32[4]{0} %p)
}

ENTRY %main (a: f32[4], b: f32[4,4]) -> (f32[4], f32[4]) {
  %a = f32[4]{0} parameter(0)
  %b = f32[4,4]{1,0} parameter(1)
  %c = f32[] constant(1)
  %fusion = f32[4]{0} fusion(f32[4]{0} %a), kind=kLoop, calls=%fused_computation
  %dot = f32[4]{0} dot(f32[4,4]{1,0} %b, f32[4]{0} %fusion), lhs_contracting_dims={1}
  %bitcast = f32[4]{0} bitcast(f32[4]{0} %dot)
  %copy = f32[4]{0} copy(f32[4]{0} %bitcast)
  ROOT %tuple = (f32[4]{0}, f32[4]{0}) tuple(f32[4]{0} %fusion, f32[4]{0} %copy)
}
"""
    assert programs.kernels_of(hlo) == 3  # the fusion, the dot and the copy


def test_one_program_is_one_up_to_names_parameter_order_and_unread_instructions():
    from benchmarks.real_models import programs

    def step(first, second, dead=""):
        return f"""HloModule {first}

ENTRY %main.{second} (a: f32[4], b: f32[4]) -> (f32[4]) {{
  %{first} = f32[4]{{0}} parameter(0)
  %{second} = f32[4]{{0}} parameter(1)
  %z = f16[] constant(0){dead}
  %m = f32[4]{{0}} multiply(f32[4]{{0}} %{first}, f32[4]{{0}} %{second})
  ROOT %t = (f32[4]{{0}}) tuple(f32[4]{{0}} %m)
}}
"""

    plain = step("a", "b")
    unread = "\n  %zeros = f16[8]{0} broadcast(f16[] %z), dimensions={}"
    assert programs.same_program(plain, step("x", "y", unread))  # names, an unread broadcast
    assert not programs.same_program(plain, step("a", "b").replace(" multiply(", " add("))
    read = step("a", "b").replace("tuple(f32[4]{0} %m)", "tuple(f32[4]{0} %z)")
    assert not programs.same_program(plain, read)


def test_kernels_that_only_feed_a_conditional_are_found_through_its_operand_tuple():
    from benchmarks.real_models import programs

    hlo = """HloModule m

%b (t: (f16[4])) -> f32[] {
  %t = (f16[4]{0}) parameter(0)
  ROOT %z = f32[] constant(0)
}

ENTRY %main (a: f32[4], p: pred[]) -> (f32[4], f32[]) {
  %a = f32[4]{0} parameter(0)
  %p = pred[] parameter(1)
  %rounded = f16[4]{0} fusion(f32[4]{0} %a), kind=kLoop, calls=%round
  %shared = f16[4]{0} fusion(f32[4]{0} %a), kind=kLoop, calls=%round
  %used = f32[4]{0} fusion(f16[4]{0} %shared), kind=kLoop, calls=%widen
  %operands = (f16[4]{0}, f16[4]{0}) tuple(f16[4]{0} %rounded, f16[4]{0} %shared)
  %nothing = () tuple()
  %cond = f32[] conditional(%p, %operands, %nothing), true_computation=%b, false_computation=%b
  ROOT %out = (f32[4]{0}, f32[]) tuple(f32[4]{0} %used, f32[] %cond)
}
"""
    # %shared feeds the branch and %used; only %rounded exists for the branch alone
    assert programs.for_branches_only(hlo) == ["%rounded"]


def test_hlo_instructions_count_under_the_tensorflow_operation_that_made_them():
    from benchmarks.real_models import programs

    def meta(op_name):
        return f', metadata={{op_type="X" op_name="{op_name}"}}'

    hlo = f"""HloModule m

%branch (t: (f16[4])) -> f32[] {{
  %t = (f16[4]{{0}}) parameter(0)
  %g = f16[4]{{0}} get-tuple-element((f16[4]{{0}}) %t), index=0
  %w = f32[4]{{0}} convert(f16[4]{{0}} %g){meta("cond_3/Mean_2")}
  %z = f32[] constant(0){meta("cond_3/Mean_2")}
  ROOT %r = f32[] reduce(f32[4]{{0}} %w, f32[] %z), to_apply=%add{meta("cond_1/Mean")}
}}

ENTRY %main (a: f32[4]) -> f32[4] {{
  %a = f32[4]{{0}} parameter(0)
  %m = f32[4]{{0}} multiply(f32[4]{{0}} %a, f32[4]{{0}} %a){meta("gradient_tape/m_1/d_2/mul_3")}
  ROOT %n = f32[4]{{0}} negate(f32[4]{{0}} %m){meta("Neg")}
}}
"""
    assert programs.origins_of(hlo) == {
        "cond/Mean": 3,  # numbers dropped: one origin in every branch
        "(none)": 3,  # parameters and the tuple's element
        "gradient_tape/.../mul": 1,  # the layer's path between left out
        "Neg": 1,
    }
