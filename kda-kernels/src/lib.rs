//! kda-kernels
