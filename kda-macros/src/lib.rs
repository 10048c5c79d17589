//! kda-macros
