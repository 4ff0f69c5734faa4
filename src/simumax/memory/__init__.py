"""Memory: static model states and the activation walk of one micro-batch."""
