"""Task-specific data, losses and training loops that are not next-token prediction."""
