from glob import glob

from setuptools import find_packages, setup

package_name = 'unilab_ros'

setup(
    name=package_name,
    version='0.1.0',
    packages=find_packages(exclude=['test', 'test.*']),
    # The native activations' sources, so an installed package can build them
    # (python -m unilab_ros.rl.native), and the module when `make setup` built it.
    package_data={
        'unilab_ros.rl.native': ['*.cpp', 'CMakeLists.txt', '_unilab_native*.so'],
        'unilab_ros.ros.middleware': ['*.xml'],
        'unilab_ros.sims': ['models/*.xml'],
    },
    data_files=[
        ('share/ament_index/resource_index/packages', ['resource/' + package_name]),
        ('share/' + package_name, ['package.xml']),
        ('share/' + package_name + '/launch', glob('launch/*.launch.py')),
        ('share/' + package_name + '/config', glob('config/*.yaml')),
        ('share/' + package_name + '/config/robots', glob('config/robots/*.yaml')),
        ('share/' + package_name + '/config/robot_specs', glob('config/robot_specs/*.yaml')),
        ('share/' + package_name + '/config/robot_train', glob('config/robot_train/*.yaml')),
    ],
    install_requires=['setuptools'],
    zip_safe=True,
    maintainer='unilab maintainers',
    maintainer_email='maintainers@unilab.invalid',
    description='MLX PPO trainer for robots driven over ROS 2 topics',
    license='Apache-2.0',
    python_requires='>=3.10',
    entry_points={
        'console_scripts': [
            'trainer_node = unilab_ros.trainer.node:main',
            'policy_node = unilab_ros.deploy.policy_node:main',
            'gym_env_node = unilab_ros.sims.gym_env_node:main',
            'mujoco_robot_node = unilab_ros.sims.mujoco_robot_node:main',
            'sim_train = unilab_ros.tools.sim_train:main',
            'pendulum_demo = unilab_ros.tools.demo:main',
            'export_bundle = unilab_ros.deploy.export_bundle:main',
        ],
    },
)
