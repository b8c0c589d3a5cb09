"""One robosuite Panda simulator for one task family, reset to an exact scene from a task's seed.

Why a wrapper and not `suite.make` per episode: building an environment costs
seconds (XML generation and compilation), a reset costs milliseconds. The
environment is built once with `hard_reset=False`, so the MuJoCo model survives
resets and the renderer, the shadow setting and any model edits stay valid.

Exact replay: robosuite draws the robot's initial-joint noise and the object
placements from `env.rng`, which it creates once from `suite.make(seed=...)`
and shares with the placement samplers. `reset(spec)` replaces that generator
(in the env and in every sampler) by one seeded from `spec.seed`, so the initial
state is a function of the seed alone, whatever ran before.

Rendering: our own `mujoco.Renderer` on the env's model, not robosuite's camera
observables, so a frame is drawn only when an observation is asked for (once
per action chunk, not once per low-level step). Shadows and floor reflections
are off: on a software GL (llvmpipe) they dominate the frame's cost and are
invisible at 64x64. `mujoco.Renderer` already returns rows top-down, so the
image is upright as read (robosuite's own `sim.render` is the one upside down).

A `Variation` edits the compiled model in place: the object's colour (its
textured material dropped), its box half-sizes (with the collision bounds that
MuJoCo's broad phase uses) and the samplers' placement ranges. Base values are
kept and restored, so a later plain task sees the default scene.
"""

from __future__ import annotations

import importlib
import logging
import os

os.environ.setdefault("MUJOCO_GL", "egl")
# robosuite logs at INFO on import and per scene (controller files, an optional IK it lacks):
# keep its errors only, set before its import creates the logger's handlers
logging.getLogger("robosuite_logs").addFilter(lambda record: record.levelno >= logging.ERROR)

from dataclasses import dataclass  # noqa: E402

try:  # measured: triton (which DeepSpeed imports) segfaults when first imported after an EGL context exists
    importlib.import_module("triton")
except ImportError:
    pass

import mujoco  # noqa: E402
import numpy as np  # noqa: E402
import robosuite  # noqa: E402
from robosuite.utils.placement_samplers import UniformRandomSampler  # noqa: E402

from wmrl.domains.vla.tasks import VLATaskSpec, Variation, family  # noqa: E402

CAMERA = "agentview"


@dataclass
class Privileged:
    """Ground-truth state a scripted controller may use (a learned policy sees only the observation)."""

    eef_pos: np.ndarray
    gripper_qpos: np.ndarray
    object_pos: np.ndarray
    object_half_height: float
    #: where the object must go: the support cube's centre (stack), the bin spot (can), None (lift)
    target_pos: np.ndarray | None
    target_half_height: float
    table_z: float


class Simulator:
    """A robosuite env for one family: `reset(spec)`, `step(action7)`, `observation()`."""

    def __init__(self, family_name: str, image_size: int = 64, horizon_steps: int | None = None, control_freq: int = 20):
        fam = family(family_name)
        self.family = family_name
        self.horizon_steps = horizon_steps or fam.horizon_steps
        self.resizable = fam.resizable
        self.env = robosuite.make(
            fam.env_name,
            robots="Panda",
            has_renderer=False,
            has_offscreen_renderer=False,
            use_camera_obs=False,
            use_object_obs=True,
            hard_reset=False,
            control_freq=control_freq,
            # the episode's length is ours (horizon_steps); robosuite must never end it
            horizon=10**9,
            ignore_done=True,
            reward_shaping=False,
            seed=0,
        )
        model = self.env.sim.model._model
        model.vis.quality.shadowsize = 0
        self.renderer = mujoco.Renderer(model, image_size, image_size)
        self.renderer.scene.flags[mujoco.mjtRndFlag.mjRND_REFLECTION] = 0
        self.samplers = list(_uniform_samplers(self.env.placement_initializer))
        self.base_ranges = [(np.array(s.x_range, float), np.array(s.y_range, float)) for s in self.samplers]
        obj = self._object()
        self.object_joint = obj.joints[0]
        self.visual_geoms = [model.geom(n).id for n in obj.visual_geoms]
        self.object_geoms = sorted({*self.visual_geoms, *(model.geom(n).id for n in obj.contact_geoms)})
        self.base = {
            "rgba": model.geom_rgba.copy(),
            "matid": model.geom_matid.copy(),
            "size": model.geom_size.copy(),
            "rbound": model.geom_rbound.copy(),
            "aabb": model.geom_aabb.copy(),
        }
        self.base_half_height = float(obj.top_offset[2])
        self.spec: VLATaskSpec | None = None
        self.scale = 1.0
        self.steps = 0
        self.success = False
        self._obs: dict = {}

    def _object(self):
        """The object the instruction is about."""
        env = self.env
        return {"lift": lambda: env.cube, "stack": lambda: env.cubeA}.get(
            self.family, lambda: env.objects[env.object_id]
        )()

    @property
    def done(self) -> bool:
        return self.success or self.steps >= self.horizon_steps

    def reset(self, spec: VLATaskSpec) -> dict:
        if spec.family != self.family:
            raise ValueError(f"this simulator runs family {self.family!r}, got a {spec.family!r} task")
        var = spec.variation or Variation()
        if var.size_scale != 1.0 and not self.resizable:
            raise ValueError(f"family {self.family!r} cannot resize its object (a mesh); size_scale must be 1.0")
        rng = np.random.default_rng(spec.seed)
        self.env.rng = rng
        for sampler, (xr, yr) in zip(self.samplers, self.base_ranges):
            sampler.rng = rng
            sampler.x_range = _scaled(xr, var.placement_scale)
            sampler.y_range = _scaled(yr, var.placement_scale)
        self._apply_model(var)
        self.env.reset()
        if var.size_scale != 1.0:
            # placements put the object's bottom on the table for its original size
            qpos = self.env.sim.data.get_joint_qpos(self.object_joint).copy()
            qpos[2] += (var.size_scale - 1.0) * self.base_half_height
            self.env.sim.data.set_joint_qpos(self.object_joint, qpos)
            self.env.sim.forward()
        self.spec, self.scale = spec, var.size_scale
        self.steps, self.success = 0, False
        self._obs = self.env._get_observations(force_update=True)
        return self.observation()

    def _apply_model(self, var: Variation) -> None:
        model, b, g = self.env.sim.model._model, self.base, self.object_geoms
        model.geom_rgba[:] = b["rgba"]
        model.geom_matid[:] = b["matid"]
        if var.rgba is not None:
            model.geom_rgba[self.visual_geoms] = var.rgba
            model.geom_matid[self.visual_geoms] = -1
        model.geom_size[g] = b["size"][g] * var.size_scale
        model.geom_rbound[g] = b["rbound"][g] * var.size_scale
        model.geom_aabb[g] = b["aabb"][g] * var.size_scale

    def step(self, action: np.ndarray) -> bool:
        """One low-level 20 Hz step; returns whether the task is now solved."""
        if self.spec is None:
            raise RuntimeError("Simulator.step before reset")
        self._obs, _, _, _ = self.env.step(np.asarray(action, dtype=np.float64))
        self.steps += 1
        self.success = bool(self.env._check_success())
        return self.success

    def image(self) -> np.ndarray:
        self.renderer.update_scene(self.env.sim.data._data, camera=CAMERA)
        return self.renderer.render().copy()

    def state(self) -> np.ndarray:
        o = self._obs
        return np.concatenate([o["robot0_eef_pos"], o["robot0_eef_quat"], o["robot0_gripper_qpos"]]).astype(np.float32)

    def observation(self) -> dict:
        assert self.spec is not None, "observation before reset"
        return {"image": self.image(), "state": self.state(), "instruction": self.spec.instruction}

    def privileged(self) -> Privileged:
        o, env = self._obs, self.env
        table_z = float(env.model.mujoco_arena.table_offset[2]) if self.family != "pick_place_can" else float(env.bin1_pos[2])
        obj_key = {"lift": "cube_pos", "stack": "cubeA_pos"}.get(self.family, f"{self._object().name}_pos")
        target, target_half = None, 0.0
        if self.family == "stack":
            target, target_half = np.array(o["cubeB_pos"]), float(env.cubeB.top_offset[2])
        elif self.family == "pick_place_can":
            target = np.array(env.target_bin_placements[env.object_id])
        return Privileged(
            eef_pos=np.array(o["robot0_eef_pos"]),
            gripper_qpos=np.array(o["robot0_gripper_qpos"]),
            object_pos=np.array(o[obj_key]),
            object_half_height=self.base_half_height * self.scale,
            target_pos=target,
            target_half_height=target_half,
            table_z=table_z,
        )

    def close(self) -> None:
        self.renderer.close()
        self.env.close()


def _uniform_samplers(sampler):
    """Every UniformRandomSampler inside a (possibly composite) placement initializer."""
    if isinstance(sampler, UniformRandomSampler):
        yield sampler
    for child in getattr(sampler, "samplers", {}).values():
        yield from _uniform_samplers(child)


def _scaled(rng_range: np.ndarray, scale: float) -> list[float]:
    centre, half = rng_range.mean(), (rng_range[1] - rng_range[0]) / 2
    return [float(centre - half * scale), float(centre + half * scale)]
