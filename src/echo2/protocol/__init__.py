"""echo2.protocol"""
