"""adapters/anthropic"""
