//! The PyTorch memory snapshot format.
