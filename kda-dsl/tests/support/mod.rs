pub mod hopper_programs;
