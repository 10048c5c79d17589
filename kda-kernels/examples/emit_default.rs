fn main() {
    let v = &kda_kernels::variants()[0];
    let def = v.build().unwrap();
    let k = kda_dsl::compile(def, kda_dsl::Target::Sm80).unwrap();
    print!("{}", k.ptx);
}
