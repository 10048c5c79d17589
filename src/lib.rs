//! kda
