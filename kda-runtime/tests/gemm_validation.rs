//! `gemm`'s argument rules, on the host: each bad call names the argument and what was expected.

use kda_dsl::{DType, Target};
use kda_runtime::{plan_gemm, RuntimeError, TensorView};

fn t(shape: &[usize], d: DType) -> TensorView {
    // SAFETY: a descriptor for planning and binding only, never launched.
    unsafe { TensorView::from_raw(0x1000, shape, d, 0) }.expect("a view")
}

fn bad(r: Result<Option<kda_kernels::Variant>, RuntimeError>) -> (String, String) {
    match r {
        Err(RuntimeError::BadArgument { name, expected, .. }) => (name, expected),
        Err(e) => panic!("expected a bad argument, got {e}"),
        Ok(_) => panic!("expected an error"),
    }
}

#[test]
fn shapes_and_types_are_checked_with_the_argument_named() {
    let (a, bt, c) = (t(&[64, 32], DType::BF16), t(&[48, 32], DType::BF16), t(&[64, 48], DType::F32));
    assert!(plan_gemm(&a, &bt, &c, true, Target::Sm80).expect("valid").is_some());
    assert_eq!(
        bad(plan_gemm(&t(&[64], DType::BF16), &bt, &c, true, Target::Sm80)),
        ("a".into(), "a 2-D tensor".into())
    );
    assert_eq!(bad(plan_gemm(&t(&[64, 32], DType::F32), &bt, &c, true, Target::Sm80)).0, "a");
    assert_eq!(
        bad(plan_gemm(&a, &t(&[48, 32], DType::F16), &c, true, Target::Sm80)),
        ("b".into(), "bf16 (a's dtype)".into())
    );
    assert_eq!(
        bad(plan_gemm(&a, &bt, &t(&[64, 48], DType::F16), true, Target::Sm80)),
        ("c".into(), "f32 or bf16".into())
    );
    assert_eq!(bad(plan_gemm(&a, &t(&[48, 31], DType::BF16), &c, true, Target::Sm80)), ("b".into(), "[N, 32]".into()));
    assert_eq!(bad(plan_gemm(&a, &bt, &c, false, Target::Sm80)), ("b".into(), "[32, N]".into()));
    assert_eq!(bad(plan_gemm(&a, &bt, &t(&[64, 47], DType::F32), true, Target::Sm80)), ("c".into(), "[64, 48]".into()));
}

#[test]
fn ragged_extents_pick_the_unaligned_variant_and_empty_work_launches_nothing() {
    let v = plan_gemm(&t(&[5, 7], DType::F16), &t(&[3, 7], DType::F16), &t(&[5, 3], DType::F16), true, Target::Sm80)
        .expect("valid");
    assert!(v.expect("work").name.ends_with("_unaligned"));
    let none =
        plan_gemm(&t(&[0, 8], DType::BF16), &t(&[8, 8], DType::BF16), &t(&[0, 8], DType::F32), false, Target::Sm80)
            .expect("valid");
    assert!(none.is_none());
}

/// On sm_90a aligned shapes take the `wgmma` variants in both operand orders, ragged ones stay
/// on the sm_80 fallback.
#[test]
fn sm_90a_picks_the_hopper_variant_for_aligned_shapes() {
    let (a, bt, c) = (t(&[64, 32], DType::BF16), t(&[48, 32], DType::BF16), t(&[64, 48], DType::F32));
    let v = plan_gemm(&a, &bt, &c, true, Target::Sm90a).expect("valid").expect("work");
    assert_eq!((v.target, v.name.as_str()), (Target::Sm90a, "bf16_f32_abt_128x256x64_s4_t256_fw4_sm90a"));
    let b = t(&[32, 48], DType::BF16);
    let v = plan_gemm(&a, &b, &c, false, Target::Sm90a).expect("valid").expect("work");
    assert_eq!((v.target, v.name.as_str()), (Target::Sm90a, "bf16_f32_ab_128x256x64_s4_t256_fw4_sm90a"));
    let ragged =
        plan_gemm(&t(&[5, 7], DType::F16), &t(&[3, 7], DType::F16), &t(&[5, 3], DType::F16), true, Target::Sm90a);
    let v = ragged.expect("valid").expect("work");
    assert_eq!(v.target, Target::Sm80);
    assert!(v.name.ends_with("_unaligned"));
}
