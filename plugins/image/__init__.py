"""``meshctl image build|push``: the meshctl image of this binary, and pushing it to a registry."""
