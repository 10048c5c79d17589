//! Every front-end error is a compile error at the user's token (trybuild).

#[test]
fn user_errors_point_at_the_users_tokens() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/*.rs");
}
