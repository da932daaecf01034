"""adapters/openai"""
