"""The device mesh of a parallel layout: up to three named dimensions, outermost first.

    pp  pipeline stages        (point-to-point activations between neighbours)
    dp  data parallel          (FSDP2 all-gather / reduce-scatter, or DDP all-reduce)
    tp  tensor parallel        (all-gather / reduce-scatter inside every layer)

The innermost dimension varies fastest across ranks, so on one node the tensor-parallel group,
which talks at every layer, gets adjacent GPUs (one NVLink switch hop), as in torchtitan. Only dimensions larger than 1 are
in the mesh, with `dp` and the strategy's own dimensions always: plain FSDP2 keeps its 1-D mesh
over every rank.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

MESH_DIMS = ("pp", "dp", "tp")


@dataclass(frozen=True)
class MeshInfo:
    """Where this rank sits in the layout."""

    mesh: DeviceMesh
    degrees: dict[str, int]  # {"pp": .., "dp": .., "tp": ..}

    def size(self, dim: str) -> int:
        return self.degrees[dim]

    def local_rank(self, dim: str) -> int:
        return self.mesh.get_local_rank(dim) if self.degrees[dim] > 1 or dim == "dp" else 0

    def sub(self, dim: str) -> DeviceMesh | None:
        """The 1-D mesh of `dim` through this rank (None for a dimension of size 1 but dp)."""
        return self.mesh[dim] if dim in (self.mesh.mesh_dim_names or ()) else None


def build_mesh(device: str, degrees: dict[str, int], keep: tuple[str, ...] = ()) -> MeshInfo:
    """The mesh of `degrees` ({pp, dp, tp}) over every rank of the default process group;
    `keep`: dimensions kept even at size 1 (the strategy's own: TP on one rank is still TP)."""
    names = tuple(d for d in MESH_DIMS if degrees[d] > 1 or d == "dp" or d in keep)
    shape = tuple(degrees[d] for d in names)
    return MeshInfo(init_device_mesh(device, shape, mesh_dim_names=names), dict(degrees))
