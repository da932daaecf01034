"""engine/kv"""
