"""One serving object per API, built by ``create_app`` and held on ``app.state``.

Routes translate HTTP (parse, negotiate, render status and headers) and call one of these; these
hold the API's work: which rules apply, what the scheduler is asked, what the answer holds.
"""

from mmencode.app.services.chat import ChatService
from mmencode.app.services.embeddings import EmbeddingsService
from mmencode.app.services.encode import EncodeAnswer, EncodeService
from mmencode.app.services.model import ServedModel

__all__ = ["ChatService", "EmbeddingsService", "EncodeAnswer", "EncodeService", "ServedModel"]
