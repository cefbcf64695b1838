"""The short convolution of a GDN layer on draft trees (:func:`tree_conv`) and its conv-state commit
(:func:`tree_conv_commit`); torch references in :mod:`~lumotree.optimized.ops.conv_tree.reference`."""

from .kernels import ACTIVATIONS, tree_conv, tree_conv_commit

__all__ = ["tree_conv", "tree_conv_commit", "ACTIVATIONS"]
