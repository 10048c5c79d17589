pub mod assemble;
pub mod flag_programs;
pub mod hopper_programs;
