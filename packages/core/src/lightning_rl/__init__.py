"""Lightning: train any AI agent with reinforcement learning."""
