"""Three prompts of mixed lengths for the embedded Gemma 3 270M (token ids, BOS first),
shared by the test modules that run the real target."""

PROMPTS = [
    [2, 105, 2364, 107, 6974, 786, 496, 3925, 1003, 506, 5442, 236761, 106, 107, 105, 4368, 107],
    [2, 818, 5279, 529, 7001, 563],
    [2, 2364, 563, 496, 1500, 529, 4088, 236764, 2364, 563, 496, 1500, 529],
]
