"""Running compositions: staging and loading them, the memory budget, `slm run`, `slm verify`'s
numerics, the prompt cache on disk and the server's scheduler."""
