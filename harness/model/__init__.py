"""Models: load and save policies, the char Llama warm start, GGUF conversion."""
