"""Model sparsity: pruning (magnitude, global, block/row, gradual), CSR/BSR formats and kernels,
and the digits task that measures what pruning costs in accuracy.
"""
from .digits import METHODS, DigitsModel, digits_split, masks_for, steps_per_epoch, train_digits
from .formats import BSR, CSR
from .pruning import block_mask, global_magnitude_masks, magnitude_mask, polynomial_sparsity, sparsity_of

__all__ = ["BSR", "CSR", "METHODS", "DigitsModel", "block_mask", "digits_split", "global_magnitude_masks",
           "magnitude_mask", "masks_for", "polynomial_sparsity", "sparsity_of", "steps_per_epoch", "train_digits"]
