"""posttrain.guidance"""
