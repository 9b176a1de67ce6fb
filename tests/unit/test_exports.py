"""The 0.1 public names keep working after the renames."""


def test_the_0_1_names_still_reach_the_renamed_classes():
    import kvcore

    assert kvcore.KVCacheConfig is kvcore.KVCachePlan
    assert kvcore.Layout is kvcore.BlockPlacement
    assert kvcore.RankLayout is kvcore.Parallelism
