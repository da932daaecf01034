"""core/parsers"""
