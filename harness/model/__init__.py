"""Models: policy directories (load, save, GGUF conversion), the char Llama and its SFT, the warm start of a sweep."""
