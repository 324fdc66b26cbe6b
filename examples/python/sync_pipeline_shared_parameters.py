"""The example of MindSpore's `sync_pipeline_shared_parameters` document, with `mindspore`
changed to `autopar`, on 2 pipeline stages of one simulated device each. The document's
example leaves out the context, the input's closing parenthesis and the input of `compile`;
here they are written out (an input of one token per row, which `squeeze(1)` expects).

    python examples/python/sync_pipeline_shared_parameters.py
"""
import numpy as np
import autopar as ms
from autopar import lazy_inline, nn, ops, Parameter, Tensor

ms.set_auto_parallel_context(parallel_mode="semi_auto_parallel", device_num=2, pipeline_stages=2)


class VocabEmbedding(nn.Cell):
    def __init__(self, vocab_size, embedding_size):
        super().__init__()
        self.embedding_table = Parameter(Tensor(np.ones([vocab_size, embedding_size]), ms.float32),
                                         name='embedding')
        self.gather = ops.Gather()

    def construct(self, x):
        output = self.gather(self.embedding_table, x, 0)
        output = output.squeeze(1)
        return output, self.embedding_table.value()


class LMHead(nn.Cell):
    def __init__(self):
        super().__init__()
        self.matmul = ops.MatMul(transpose_b=True)

    def construct(self, state, embed):
        return self.matmul(state, embed)


class Network(nn.Cell):
    @lazy_inline
    def __init__(self):
        super().__init__()
        self.word_embedding = VocabEmbedding(vocab_size=4, embedding_size=4)
        self.head = LMHead()

    def construct(self, x):
        x, embed = self.word_embedding(x)
        x = self.head(x, embed)
        return x


net = Network()
net.word_embedding.pipeline_stage = 0
net.head.pipeline_stage = 1
x = Tensor(np.ones((8, 1)), ms.int32)
net.compile(x)
ms.sync_pipeline_shared_parameters(net)
print(net.word_embedding.embedding_table.asnumpy())
print(net(x).asnumpy()[0])
