"""Operations: cluster resources and plans, released-checkpoint fetch, `inspect`, the method scaffold."""
