pub mod assemble;
pub mod hopper_programs;
