"""The model: the Llama family over a paged KV cache, its loader and tokenizer."""
