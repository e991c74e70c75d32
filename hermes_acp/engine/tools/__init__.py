"""The tools the agent offers the model."""
