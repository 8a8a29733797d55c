"""echo2.models"""
