from forktools.queue import metadata


def test_wheel_requirements_are_translated_exactly(project):
    meta = metadata.read(project.wheel)
    assert meta.requires_python == ">=3.10"
    assert meta.install_requires == ["numpy", 'six>=1.16.0; python_version > "3.11"']
    assert meta.extras_require == {"audio": ["scipy"]}
    assert meta.entry_points == {
        "console_scripts": ["vllm = vllm.entrypoints.cli.main:main"]
    }
