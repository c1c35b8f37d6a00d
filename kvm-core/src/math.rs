//! Small dense helpers of the forward pass (LayerNorm, activations, softmax, RoPE tables).
