"""Ray (where GPU stages run) and model weights, as resources chosen per profile."""

from __future__ import annotations

import os

from dagster import ConfigurableResource, Failure, InitResourceContext

from pipelines.compute.weights import ModelUnavailableError
from pipelines.concepts.dinov2 import DEFAULT_MODEL, EmbedderConfig
from pipelines.concepts.dinov2 import check_weights as check_dinov2
from pipelines.panels.detector import DEFAULT_MODEL as DEFAULT_DETECTOR
from pipelines.panels.detector import DetectorConfig, check_weights


class RayResource(ConfigurableResource):
    """``address`` None starts Ray on this machine (CPU); ``ray://head:10001`` uses a cluster.

    ``actors`` x ``gpus_per_actor`` is how a run packs the GPUs: e.g. 8 actors with 1 GPU each
    on an 8-GPU node, or 16 with 0.5 to put two small-model replicas on every GPU.
    ``actor_resources`` adds Ray custom resources per actor (``{"a100": 1}``) to pin the model
    actors to the nodes that advertise them; empty in production, where ``num_gpus`` suffices.
    """

    address: str | None = None
    actors: int = 1
    gpus_per_actor: float = 0.0
    batch_size: int = 32
    actor_resources: dict[str, float] = {}
    # a node lost mid-partition (ComputeUnavailableError): retry the step this often, this far apart
    outage_retries: int = 0
    outage_retry_delay_s: float = 300.0

    def setup_for_execution(self, context: InitResourceContext) -> None:
        # A Ray started here uses token authentication, Ray's default for a new local cluster;
        # saying so explicitly (RAY_AUTH_MODE) keeps Ray from printing that notice every run.
        if self.address is None:
            os.environ.setdefault("RAY_AUTH_MODE", "token")


class ModelsResource(ConfigurableResource):
    """Model weights by id or local directory. ``synthetic`` builds tiny random models from
    configs in code (tests, demo); everything they produce is marked ``synthetic``."""

    dinov2: str = DEFAULT_MODEL
    dinov2_pooling: str = "cls"
    dinov2_pad: bool = False
    synthetic: bool = False
    panel_detector: str | None = DEFAULT_DETECTOR  # None: the weight-free layout splitter alone
    panel_detector_revision: str | None = None
    panel_threshold: float = 0.5
    panel_input_size: int = 800
    panel_labels: int = 1  # 2: also the panel-label glyph boxes (the checkpoint must have that class)
    panel_class: int | None = None  # None: the class the checkpoint's id2label names subfigure/panel
    # the tokenizer of the text encoder that will train on the captions (long captions are
    # measured and cut in its tokens): openclip, hf:<id or path>, tiny; and its context length
    text_tokenizer: str = "openclip"
    text_context: int = 512

    def dinov2_config(self, check: bool = False) -> EmbedderConfig:
        """The embedder's config; with ``check`` (what the embedding asset does as it builds its
        stage) weights that are missing or a config that is not DINOv2's fail here in one line
        naming ``PANELFORGE_DINOV2_MODEL`` and the ``hf download`` command, before Ray starts."""
        config = EmbedderConfig(
            model=self.dinov2, synthetic=self.synthetic, pooling=self.dinov2_pooling, pad=self.dinov2_pad
        )
        if check:
            try:
                check_dinov2(config)
            except (ModelUnavailableError, ValueError) as exc:
                raise Failure(str(exc), allow_retries=False) from None
        return config

    def detector_config(self, check: bool = True) -> DetectorConfig | None:
        """The panel detector, or None when no weights are configured (layout splitter only).

        With ``check`` (what an asset does as it builds its stage) weights that are missing, or a
        config that cannot be read or has no panel class, fail here in one line that names the
        setting and the ``hf download`` command (``detector.check_weights``), before any Ray
        worker starts, rather than in every actor after the cluster came up."""
        if not self.panel_detector:
            return None
        config = DetectorConfig(
            model=self.panel_detector,
            revision=self.panel_detector_revision,
            synthetic=self.synthetic,
            threshold=self.panel_threshold,
            input_size=self.panel_input_size,
            labels=self.panel_labels,
            panel_class=self.panel_class,
        )
        if check:
            try:
                check_weights(config)
            except (ModelUnavailableError, ValueError) as exc:
                raise Failure(str(exc), allow_retries=False) from None
        return config
