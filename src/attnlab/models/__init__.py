"""Models built from the blocks: GPT, encoder, encoder-decoder, LSTM, ViT."""
