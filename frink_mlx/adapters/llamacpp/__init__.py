"""adapters/llamacpp"""
