"""Vision-language model engines: one interface (batched chat requests with images in, text and
token counts out) over several backends (transformers in-process, an OpenAI-compatible server,
vLLM on Ray Data), and the parsing of grounded boxes per model family."""
