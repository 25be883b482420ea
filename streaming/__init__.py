from codec.native import attach

attach(__name__, __path__)
