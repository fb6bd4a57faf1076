"""SFT data and training, rollout engines, rewards, the CISPO loss and trainer, curriculum."""
